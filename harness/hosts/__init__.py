"""Several hosts: network namespaces standing in for hosts on one machine (netns), and the
agent each host runs with the coordinator's rendezvous that finds them (agent).  The
launcher a cell starts remote roles with is harness.drive.remote."""
