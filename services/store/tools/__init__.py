"""Offline tools over a store directory: inspection and the RocketMQ layout export."""
