"""TokenSpeed's configuration: the ServerArgs contract, its resolution, and what is derived from it.

The memory model here is the one both the console's planner and the server call.
"""
