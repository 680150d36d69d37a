"""PySpark jobs over event logs and pcap archives (a later issue). Nothing imports `pipeline`."""
