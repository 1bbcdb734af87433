"""Reformer (Kitaev et al., 2020): under construction (issue 8)."""
