"""Placeholder until measured."""
