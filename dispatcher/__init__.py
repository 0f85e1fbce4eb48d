"""The dispatcher: admission, queue policies, capacity, partitions, and units for the shards."""

from gosched.dispatcher.dispatcher import Dispatcher

__all__ = ["Dispatcher"]
