"""The public gRPC endpoint: auth, routing over shards, queue selection, retries (MessagingService)."""
