"""`python -m pipeline JOB ...` and `spark-submit pipeline/__main__.py JOB ...`."""

import sys

from pipeline.cli import main

sys.exit(main())
