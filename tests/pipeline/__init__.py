"""Tests of the fleet pipeline on Spark: jobs, pcap decoding, windows, the report, a standalone
cluster.
"""
