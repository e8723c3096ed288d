"""Attribution: who holds and uses each GPU, how it is shared, the fleet funnel and its cost.

One pass (`pipeline.attribute`), each stage a module, entered once and in this order: targets (what can
be held) → claims (who was given each) → owners (who runs each process) → workloads (each holder's share
and use) → idle_reasons (why a held GPU idles) → fleet (funnel, capacity, cost).
"""
