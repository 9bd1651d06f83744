"""What a scenario is made of: the step vocabulary, scenarios, KVPoll and layouts, frames, the layout planning rules."""
