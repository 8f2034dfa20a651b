# JupyterHub with each user's notebook server in one of their gpuctl teams (docs/jupyterhub.md).
# Copy to /etc/jupyterhub/jupyterhub_config.py, or add these lines to the one you have. The hub
# runs as root: SystemdSpawner starts each server as a transient systemd service.
import sys

sys.path.insert(0, "/usr/share/gpuctl/jupyterhub")

c.JupyterHub.spawner_class = "gpuctl_spawner.GpuctlSpawner"

# A user in no team: "refuse" (the default) fails the spawn with a message; "cpu" starts a
# server with no GPU, outside every share.
c.GpuctlSpawner.no_team = "refuse"

# A share whose devices are all held: without this the spawn fails at once, naming the holders
# (in the server's journal); with it the server waits in the team's queue.
# c.GpuctlSpawner.run_options = ["--wait=10m"]
# c.Spawner.start_timeout = 660
# c.Spawner.http_timeout = 660

# gpuctl's idle rules ([teams.NAME.idle], action = "stop") stop a GPU-idle server; the hub
# notices at its next poll and shows the server stopped.
c.Spawner.poll_interval = 30
