"""devpilot-dispatch: the small library the serverless functions share.

The delivery guarantee is the `dispatch_queue` table; everything here is the code that writes and
reads it correctly (`queue.py`), plus the plumbing around it (settings, connections, migrations).
"""
