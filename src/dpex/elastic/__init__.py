"""The elastic control: how many worker processes, where, and which logical workers each
hosts, window by window (``control``); its pure policies (``scaling``, ``allocation``,
``move_policy``, ``growth_policy``, ``store_budget``, ``placement``'s ``pick_node``); and its
reach into Ray's autoscaler (``cluster_growth``, ``node_following``).

May import: workers, epoch, observe, cache, ray_session and the leaves. The policies are
pure: no Ray, anywhere in what they import (tests/test_layout.py).
"""
