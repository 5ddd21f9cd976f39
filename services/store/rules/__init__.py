"""Rules every service checks the same way: names, bounds, topics, subscriptions."""
