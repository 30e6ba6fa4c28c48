"""What the service's operators see and do: the figures of `devpilot status`, the dashboard and
the metrics (`status`), a page per session with its search and the operators' actions on it
(`sessions`), what is kept and for how long (`retention`, run by the sweep), and the
dashboard's own sign-in (`dashboard_signin`). It reads what the rooms below wrote; no room below
reads it.

May import: shared.plumbing, shared.linear, shared.fleet, shared.delivery, shared.wire.
"""
