"""What this host is, and how files are written on it. Standard library only.

  gpus       every GPU reading (nvidia-smi): devices, memory, use
  installed  the distributions on a search path, read from their *.dist-info without importing them
  paths      the agent's workdir and the folders under it
  atomic     writes that matter: a file or a whole folder, beside then renamed in
  netif      which network interface holds an address (the one torch's collectives must use)
  revision   which specops this agent is: the commit of the checkout it came from, and whether it was dirty
"""
