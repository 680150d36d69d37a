"""How a setting's value is read, the same from a flag, a KAFKA_CENSUS_* variable or YAML.

Owns the value parsers every command's SETTINGS table uses (exporter/cli.py, aggregate.py,
incident.py): each takes what argparse, the environment or `yaml.safe_load` gives and returns
the value or raises ValueError. YAML's `true` is not an integer and `2.5` not a count. Standard
library only; imports nothing of the project, so any command module can use it.
"""

from __future__ import annotations


def parse_csv(value) -> list[str]:
    """A YAML list, or "a, b,c" from a flag or a variable."""
    if isinstance(value, list):
        return [str(v) for v in value]
    return [v.strip() for v in str(value).split(",") if v.strip()]


def parse_int(value) -> int:
    """An integer from a flag, a variable or YAML; YAML's true or 2.5 are not integers."""
    if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
        raise ValueError(value)
    return int(value)


def parse_float(value) -> float:
    if isinstance(value, bool):
        raise ValueError(value)
    return float(value)


def parse_str(value) -> str:
    if not isinstance(value, (str, int)) or isinstance(value, bool):
        raise ValueError(value)
    return str(value)


def parse_bool(value) -> bool:
    """YAML's true/false; from a variable true/false, yes/no, on/off or 1/0."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        word = value.strip().lower()
        if word in ("true", "yes", "on", "1"):
            return True
        if word in ("false", "no", "off", "0"):
            return False
    raise ValueError(value)
