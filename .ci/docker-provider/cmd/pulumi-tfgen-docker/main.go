// pulumi-tfgen-docker writes the plugin's Pulumi schema: `pulumi-tfgen-docker schema --out DIR`
// writes DIR/schema.json, which cmd/pulumi-resource-docker embeds.
package main

import (
	"github.com/pulumi/pulumi-terraform-bridge/v3/pkg/tfgen"

	provider "deepseek-spark/docker-provider"
)

func main() {
	tfgen.Main("docker", provider.Version, provider.Provider())
}
