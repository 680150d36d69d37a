"""Tests of what ships: the image, the Helm chart, the dashboards and alert rules, the demo."""
