"""GpuctlSpawner: JupyterHub's SystemdSpawner, each notebook server in one of its user's gpuctl teams.

The server's unit runs in gpu-<team>.slice and its command goes through `gpuctl run --team
<team>`, so gpuctld places it on one free device of the share, fenced to it, with a lease in the
user's name and the CUDA variables of that device only; the lease ends with the server, and the
team's idle rules stop a GPU-idle server like any job. gpuctld decides who may join which team:
the spawner asks it as the user (`gpuctl teams --json`), so a form cannot name a team that
`gpuctl run` would refuse anyway. Documented in /usr/share/doc/gpuctl/jupyterhub.md.
"""

import asyncio
import html
import json
import pwd

from systemdspawner import SystemdSpawner
from tornado import web
from traitlets import Enum, Float, List, Unicode, default


class GpuctlSpawner(SystemdSpawner):
    gpuctl = Unicode(
        "/usr/bin/gpuctl", help="The gpuctl command (it asks gpuctld over the system bus)."
    ).tag(config=True)

    run_options = List(
        Unicode(),
        default_value=[],
        help="""More `gpuctl run` options, e.g. ["--wait=10m"] to queue while the share is
        full (raise Spawner.start_timeout and http_timeout to match).""",
    ).tag(config=True)

    no_team = Enum(
        ["refuse", "cpu"],
        default_value="refuse",
        help="""A user in no team: "refuse" fails the spawn with a message naming gpuctl teams;
        "cpu" starts a server outside every share, with CUDA_VISIBLE_DEVICES empty (the
        device fence of the host keeps GPUs closed to it anyway).""",
    ).tag(config=True)

    cpu_slice = Unicode(
        "", help="""The slice of a CPU-only server (no_team = "cpu"); empty: systemd's default."""
    ).tag(config=True)

    teams_timeout = Float(
        20.0, help="Seconds to wait for `gpuctl teams` before failing the spawn."
    ).tag(config=True)

    # The team of the server now running (or last started), kept across a hub restart.
    gpuctl_team = Unicode(None, allow_none=True)

    @default("options_from_form")
    def _gpuctl_options_from_form(self):
        def from_form(form_data):
            team = form_data.get("team", [""])[0]
            return {"team": team} if team else {}

        return from_form

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # The configured command, without the `gpuctl run` prefix a spawn puts before it.
        self._plain_cmd = list(self.cmd)
        self._plain_slice = self.slice

    def _unix_user(self):
        return pwd.getpwnam(self._expand_user_vars(self.username_template))

    async def user_teams(self):
        """The teams gpuctld lets this user join, asked as the user (names, in its order)."""
        pw = self._unix_user()
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": pw.pw_dir, "LANG": "C.UTF-8"}
        try:
            proc = await asyncio.create_subprocess_exec(
                self.gpuctl, "teams", "--json",
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                user=pw.pw_uid, group=pw.pw_gid, extra_groups=[], env=env, cwd="/",
            )
        except OSError as e:
            raise web.HTTPError(503, f"cannot run {self.gpuctl} teams: {e}") from e
        try:
            out, err = await asyncio.wait_for(proc.communicate(), self.teams_timeout)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()
            raise web.HTTPError(503, f"gpuctl teams did not answer in {self.teams_timeout:g} s")
        if proc.returncode != 0:
            why = err.decode(errors="replace").strip() or f"exit status {proc.returncode}"
            raise web.HTTPError(503, f"gpuctl teams failed for {pw.pw_name}: {why}")
        try:
            return [t["team"] for t in json.loads(out)]
        except (ValueError, TypeError, KeyError) as e:
            raise web.HTTPError(503, f"gpuctl teams gave no team list: {e}") from e

    async def get_options_form(self):
        teams = await self.user_teams()
        last = (self.user_options or {}).get("team")
        # One team (or none, which start() handles): nothing to choose, spawn at once. Unless
        # the hub would reuse a last choice that is no longer the user's: then pick again.
        if len(teams) < 2 and (last is None or last in teams):
            return ""
        choices = "\n".join(
            '<option value="{0}"{1}>{0}</option>'.format(
                html.escape(t), " selected" if t == last else ""
            )
            for t in teams
        )
        return (
            '<label for="gpuctl-team">Team (its GPU share: one free device is yours while the'
            " server runs)</label>\n"
            f'<select class="form-control" name="team" id="gpuctl-team">\n{choices}\n</select>'
        )

    def get_env(self):
        env = super().get_env()
        if self.gpuctl_team is None:
            # CPU-only: CUDA sees no device rather than failing on the fenced ones.
            env["CUDA_VISIBLE_DEVICES"] = ""
        return env

    async def start(self):
        teams = await self.user_teams()
        asked = (self.user_options or {}).get("team") or None
        if asked is None and teams:
            asked = teams[0]
        name = self.user.name
        if asked is None:
            if self.no_team == "refuse":
                raise web.HTTPError(
                    403,
                    f"{name} is in no gpuctl team on this host, so there is no GPU share to start"
                    " a server in; an admin adds you to a team (`gpuctl teams` lists yours)",
                )
            self.gpuctl_team = None
            self.slice = self.cpu_slice or self._plain_slice
            self.cmd = list(self._plain_cmd)
        elif asked not in teams:
            raise web.HTTPError(
                403,
                f"{name} may not use team {asked!r}; yours: {', '.join(teams) or 'none'}",
            )
        else:
            self.gpuctl_team = asked
            self.slice = f"gpu-{asked}.slice"
            self.cmd = [self.gpuctl, "run", "--team", asked, *self.run_options, "--"] + list(
                self._plain_cmd
            )
        self.log.info(
            "user:%s server in %s (team %s)", name, self.slice or "the default slice",
            self.gpuctl_team or "none: CPU only",
        )
        return await super().start()

    def get_state(self):
        state = super().get_state()
        if self.gpuctl_team:
            state["gpuctl_team"] = self.gpuctl_team
        return state

    def load_state(self, state):
        super().load_state(state)
        self.gpuctl_team = state.get("gpuctl_team")

    def clear_state(self):
        super().clear_state()
        self.gpuctl_team = None
