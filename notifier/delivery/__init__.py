"""From accepted notification to pushes: the priority queue, push workers, push adapters."""
