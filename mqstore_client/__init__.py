"""The Python client of mqstore: Producer and PullConsumer over the gateway's MessagingService."""
