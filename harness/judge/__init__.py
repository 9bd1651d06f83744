"""Pure judgement: the history, checks, the behaviour diff, expectations, the result tree and the judge."""
