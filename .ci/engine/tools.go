//go:build tools

// The Pulumi CLI's main package, built from the Go module proxy by .ci/engine-setup. A wrapper
// module is needed: pkg/v3's own go.mod replaces atotto/clipboard (copied into go.mod here) and
// sdk/v3 (a local path; required here at the same version instead), and a dependency's replace
// directives do not apply to the module that requires it.
package tools

import _ "github.com/pulumi/pulumi/pkg/v3/cmd/pulumi"
