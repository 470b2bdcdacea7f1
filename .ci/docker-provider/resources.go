// Package provider maps the upstream Terraform docker provider onto pulumi-docker 5.2.0's names, so
// that the Python SDK pulumi_docker==5.2.0 (which the program uses) and this plugin agree on every
// token and property. Our own mapping, written against the SDK's generated code: the tokens are the
// SDK's (pulumi_docker/*.py), the overrides are those where the bridge's defaults would differ from
// the SDK. tests/conformance/test_docker_provider_schema.py checks the result against the SDK.
package provider

import (
	"context"

	"github.com/pulumi/pulumi-terraform-bridge/v3/pkg/tfbridge"
	shimv2 "github.com/pulumi/pulumi-terraform-bridge/v3/pkg/tfshim/sdk-v2"
	"github.com/pulumi/pulumi/sdk/v3/go/common/tokens"
	"github.com/terraform-providers/terraform-provider-docker/shim"
)

// Version is the version the plugin reports: the SDK's (pulumi_docker/pulumi-plugin.json says
// {"name": "docker", "version": "5.2.0"}), so the engine picks this plugin for the SDK's resources.
const Version = "5.2.0"

// resource makes the SDK's token for a resource or function of the index module:
// "docker:index/remoteImage:RemoteImage" for ("remoteImage", "RemoteImage").
func resource(file, name string) tokens.Type {
	return tokens.Type("docker:index/" + file + ":" + name)
}

func function(file, name string) tokens.ModuleMember {
	return tokens.ModuleMember("docker:index/" + file + ":" + name)
}

// Provider is the bridge's description of the plugin: the upstream SDKv2 provider plus our names.
func Provider() tfbridge.ProviderInfo {
	prov := tfbridge.ProviderInfo{
		P:           shimv2.NewProvider(shim.NewProvider()),
		Name:        "docker",
		Version:     Version,
		Description: "A Pulumi package for interacting with Docker in Pulumi programs",
		Keywords:    []string{"pulumi", "docker"},
		License:     "Apache-2.0",
		Homepage:    "https://pulumi.io",
		Repository:  "https://github.com/pulumi/pulumi-docker",
		GitHubOrg:   "kreuzwerker",
		// The descriptions come from the upstream's docs/ (tfgen runs in the build directory, where
		// .ci/docker-provider-setup puts the upstream copy): descriptions only, no behaviour.
		UpstreamRepoPath: "./upstream",
		Config: map[string]*tfbridge.SchemaInfo{
			// Required in Terraform with a default function; optional in the SDK, defaulting to
			// $DOCKER_HOST and then the local socket.
			"host": {
				Default: &tfbridge.DefaultInfo{
					EnvVars: []string{"DOCKER_HOST"},
					ComputeDefault: func(context.Context, tfbridge.ComputeDefaultOptions) (interface{}, error) {
						return "unix:///var/run/docker.sock", nil
					},
				},
			},
			// A set of blocks: the bridge would call it registryAuths; the SDK says registry_auth.
			"registry_auth": {Name: "registryAuth", MaxItemsOne: tfbridge.False()},
		},
		Resources: map[string]*tfbridge.ResourceInfo{
			"docker_container": {
				Tok: resource("container", "Container"),
				// Replacing a container whose name is set must remove the old one first, else Docker
				// refuses the new one ("the container name is already in use").
				DeleteBeforeReplace: true,
				Fields: map[string]*tfbridge.SchemaInfo{
					// A list but one command line: not "commands".
					"command": {Name: "command"},
					// A list of blocks, not pluralized in the SDK.
					"networks_advanced": {Name: "networksAdvanced"},
				},
			},
			"docker_image": {
				Tok: resource("remoteImage", "RemoteImage"),
				// The image reference: keep it required (no auto-naming).
				Fields: map[string]*tfbridge.SchemaInfo{"name": {Name: "name"}},
			},
			"docker_volume":         {Tok: resource("volume", "Volume")},
			"docker_network":        {Tok: resource("network", "Network")},
			"docker_config":         {Tok: resource("serviceConfig", "ServiceConfig")},
			"docker_secret":         {Tok: resource("secret", "Secret")},
			"docker_service":        {Tok: resource("service", "Service")},
			"docker_registry_image": {Tok: resource("registryImage", "RegistryImage")},
			"docker_plugin":         {Tok: resource("plugin", "Plugin")},
			"docker_tag":            {Tok: resource("tag", "Tag")},
			"docker_buildx_builder": {Tok: resource("buildxBuilder", "BuildxBuilder")},
		},
		DataSources: map[string]*tfbridge.DataSourceInfo{
			"docker_image":                    {Tok: function("getRemoteImage", "getRemoteImage")},
			"docker_network":                  {Tok: function("getNetwork", "getNetwork")},
			"docker_plugin":                   {Tok: function("getPlugin", "getPlugin")},
			"docker_registry_image":           {Tok: function("getRegistryImage", "getRegistryImage")},
			"docker_registry_image_manifests": {Tok: function("getRegistryImageManifests", "getRegistryImageManifests")},
			"docker_logs":                     {Tok: function("getLogs", "getLogs")},
		},
		Python: &tfbridge.PythonInfo{RespectSchemaVersion: true},
	}
	// Properties literally called "name" get an auto-name (resource name + "-" + random suffix) when
	// the program gives none, and become optional, as in the SDK (Container.name, Volume.name, ...).
	prov.SetAutonaming(255, "-")
	return prov
}
