"""The fleet: the machines that take work and the people they belong to. Orchestrators and
their bearer tokens (`orchestrators`), what each machine has checked out and its labels
(`machines`), a person signing in with Linear (`signin`) to connect a machine (`enroll`) or to
see their own (`people`, the `/me` session). It asks Linear only to learn who signed in; it
never touches the queue.

May import: shared.plumbing, shared.linear, shared.wire.
"""
