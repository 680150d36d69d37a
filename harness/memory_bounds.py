"""The connection tables' sizing rule, in bytes per entry: FLOW_BYTES (one tracked TCP flow) and
RECORD_BYTES (one registry record). tests/capture/test_table_memory.py measures each entry and
asserts it stays under these; tests/deploy/test_helm_bounds.py holds the chart's derived
`--max-flows` and `--max-connections` (helm/kafka-census/templates/_helpers.tpl) to them.
Imports nothing.
"""

from __future__ import annotations

# The sizing rule (bytes per entry, worst of what tests/capture/test_table_memory.py measures, with ~30% headroom).
FLOW_BYTES = 5632  # measured 4,190: one tracked TCP flow (--max-flows)
# measured 1,607 (closed; open ones share strings with their flow): one registry record, open
# (--max-connections) or closed (--max-closed-connections)
RECORD_BYTES = 2176
