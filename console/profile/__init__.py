"""Fleet profiles: a TOML file -> a checked `Profile` -> one `ServerSpec` and `ServerArgs` per server.

    toml.py       reading (extends chains) and errors that name the file, line and key
    schema.py     the typed [fleet] table and the servers a profile resolves to
    server.py     the [server] table -> ServerArgs fields -> ServerArgs (errors name the profile key)
    groups.py     [groups.NAME]: several kinds of server in one fleet
    fleet.py      load_profile / resolve_profile: placement, ports, each server's ServerArgs
    model.py      where the planner finds a model's config.json and checkpoint size
    plan.py       sizing against GPU readings through tokenspeed.config.memory_model
    validate.py   every error of a profile at once (`tokenspeed profile validate`)
    cli.py        what `tokenspeed profile validate | show | plan | new` do
"""

from console.profile.fleet import ResolvedFleet, load_and_resolve, load_profile, resolve_profile
from console.profile.toml import ProfileError

__all__ = ["ProfileError", "ResolvedFleet", "load_and_resolve", "load_profile", "resolve_profile"]
