"""Resource-plugin TEST DOUBLES the Pulumi engine runs in place of plugins that cannot be built here."""
