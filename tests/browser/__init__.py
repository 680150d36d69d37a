"""Tests of the incident page and /docs in a real headless Chromium."""
