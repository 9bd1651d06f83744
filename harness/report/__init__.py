"""Reports, each a pure function of one result tree: terminal, junit.xml, summary.md, index.html, run diffs."""
