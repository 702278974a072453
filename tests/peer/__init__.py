"""Peer suites: other projects' own tests, fetched and run against cachepipe (docs/peer-suites.md)."""
