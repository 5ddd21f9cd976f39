"""RocketMQ 5's gRPC protocol (``apache.rocketmq.v2.MessagingService``, the protocol of RocketMQ's proxy)
served by the gateway next to ``mqstore.v1``, so the official RocketMQ 5 clients work against mqstore by
changing their endpoint. See docs/rocketmq5.md for what is supported.

Every call is translated into calls of the gateway's own mqstore.v1 handlers, in process
(:mod:`gateway.rocketmq5.local_call`): routes, auth, queue selection, UNIQ_KEYs, transactions and the
retry/dead-letter topics are the mqstore.v1 ones, so a message sent one way is read the other way alike.
"""
