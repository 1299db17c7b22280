"""Dispatcher fleet: leases parts, reads due buckets, claims rows by LWT and hands rings off."""
