"""Tests of the capture (packets, flows, sources, replay, live) and the proxy, against tcpdump,
tshark and real clients.
"""
