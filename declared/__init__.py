"""What the user declares: the stack config's schema (`cluster`: one serving group's fields and
`ConfigError`; `stack`: the groups, router, gateway and monitoring), reading it and its secrets from
Pulumi (`settings`, the only reader of pulumi.Config), its reference page (`reference`), the value
shapes every field is checked against (`shapes`), the engine flags per engine release with the real
parsers' option tables (`flags`, `options/`), and ssh host keys (`hostkeys`).

May import: the standard library, pydantic and yaml; `pulumi` only in `settings.load`. Nothing of
this project's other folders: everything else builds on this one.
"""
