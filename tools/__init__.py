"""Build tools of the repository (`make regen`), run from its root as `python -m tools.NAME`.

Not part of the installed package (pyproject.toml packages only capture, exporter and pipeline;
the image's build context leaves tools/ out) and imported by nothing that runs in production.
"""
