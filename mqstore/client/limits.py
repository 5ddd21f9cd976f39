"""Limits of the public API (mqstore.v1) that the servers enforce and the client keeps to.

Defined once, here: the client may not import server code, and the servers already build on this package
(they share its inflate rule), so they import these too.
"""

#: Messages in one SendBatch (the gateway) or AppendBatch (the commitlog); RocketMQ's batch limit.
MAX_BATCH_MESSAGES = 1024
#: Messages one pull returns at most (RocketMQ's maxMsgNums bound).
MAX_PULL_MESSAGES = 1024
