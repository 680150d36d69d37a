"""`python -m exporter.cli`: the `kafka-census` command line."""

import sys

from exporter.cli.main import main

sys.exit(main())
