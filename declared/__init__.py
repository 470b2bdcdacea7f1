"""What the user declares: the stack config's schema (`config`, the only reader of pulumi.Config),
the value shapes every field is checked against (`shapes`), the engine flags per engine release with
the real parsers' option tables (`flags`, `options/`), and ssh host keys (`hostkeys`).

May import: the standard library, pydantic and yaml; `pulumi` only in `config.load`. Nothing of
this project's other folders: everything else builds on this one.
"""
