"""The `devpilot` command line: migrate, serve (every route on one port), status, demo."""
