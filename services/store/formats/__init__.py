"""On-disk formats: the bytes of RocketMQ's store files and the files that hold them."""
