"""Job dependencies: the plan a submission makes (pure) and the follow-up that releases
or cancels dependents."""
