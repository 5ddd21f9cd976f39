"""The scheduler service: delivers delayed messages (RocketMQ 4.9.8's ScheduleMessageService).

A message sent with DELAY=n is stored in SCHEDULE_TOPIC_XXXX queue n-1 (the commitlog service does
that); this service follows those queues, and when a unit's deliver time (its tags code) is due it
re-puts the message to its real topic and queue through the commitlog service. Its progress per
level is ``config/delayOffset.json`` under its store root. See docs/architecture.md, "Scheduler".
"""

DEFAULT_LISTEN = "127.0.0.1:9904"
