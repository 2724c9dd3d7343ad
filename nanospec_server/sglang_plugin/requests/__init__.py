"""Checks that refuse a bad request with a 400 before it can reach the scheduler."""
