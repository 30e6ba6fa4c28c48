"""The reference orchestrator: takes this machine's work from devpilot-dispatch over HTTP only.

Delivery over the network is at-least-once; this process makes the *start* exactly-once on one
machine with a small journal in its state directory (see journal.py).
"""
