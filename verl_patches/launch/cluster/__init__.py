"""The cluster's tools: Ray on the nodes, one call on every node, and what the nodes tell the head.

  ray_cluster        start and stop exactly the Ray processes this launch owns
  node_roster        which nodes have not joined the Ray cluster yet, and what the head last saw of each
  ray_node_calls     one small function run on every node of the cluster, once each, from the head
  storage_probe      is the checkpoint folder one storage every node can write, with room for the steps kept
  collective_check   ``python -m verl_patches.launch.cluster.collective_check``: every node's collectives
                     before the long run
  collective_rank    one rank of the collective check
  collective_report  what the nodes of a collective check tell each other, proven and read
  gather_logs        ``python -m verl_patches.launch.cluster.gather_logs``: every node's logs of one run
  node_logs          one node's side of gather_logs: its logs of the run as a tar stream
  stop               ``python -m verl_patches.launch.cluster.stop RUN_DIR``: stop a launch, and nothing else

Importing this package has no side effects.
"""
