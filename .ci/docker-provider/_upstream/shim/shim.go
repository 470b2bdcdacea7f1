// Package shim is OUR file, copied by .ci/docker-provider-setup into the build's copy of the upstream
// module (github.com/kreuzwerker/terraform-provider-docker, whose go.mod names it
// github.com/terraform-providers/terraform-provider-docker). Go only lets packages of that module
// import its internal/provider, so the bridge reaches the SDKv2 provider through this one function.
package shim

import (
	"github.com/hashicorp/terraform-plugin-sdk/v2/helper/schema"
	"github.com/terraform-providers/terraform-provider-docker/internal/provider"
)

// NewProvider returns the upstream's terraform-plugin-sdk/v2 provider (docker_container, docker_image,
// docker_volume, ...). The upstream's plugin-framework half (docker_compose) is not bridged, as in
// pulumi-docker.
func NewProvider() *schema.Provider {
	return provider.New("dev")()
}
