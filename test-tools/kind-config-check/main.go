// Command kind-config-check decodes a kind Cluster config the way kind v0.33.0 does
// (pkg/internal/apis/config/encoding/load.go, Parse): apiVersion and kind first, then a
// strict decode (unknown fields refused) into the public v1alpha4.Cluster type, then
// kind's own defaults. It prints the decoded config as JSON, or kind's error and exits 1.
//
// Usage: kind-config-check CONFIG.yaml   (or the config on stdin)
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"

	yaml "go.yaml.in/yaml/v3"
	"sigs.k8s.io/kind/pkg/apis/config/v1alpha4"
)

type typeMeta struct {
	Kind       string `yaml:"kind,omitempty"`
	APIVersion string `yaml:"apiVersion,omitempty"`
}

func decode(raw []byte) (*v1alpha4.Cluster, error) {
	tm := typeMeta{}
	if err := yaml.Unmarshal(raw, &tm); err != nil {
		return nil, fmt.Errorf("could not determine kind / apiVersion for config: %w", err)
	}
	if tm.APIVersion != "kind.x-k8s.io/v1alpha4" {
		return nil, fmt.Errorf("unknown apiVersion: %s", tm.APIVersion)
	}
	if tm.Kind != "Cluster" {
		return nil, fmt.Errorf("unknown kind %s for apiVersion: %s", tm.Kind, tm.APIVersion)
	}
	cfg := &v1alpha4.Cluster{}
	d := yaml.NewDecoder(bytes.NewReader(raw))
	d.KnownFields(true)
	if err := d.Decode(cfg); err != nil {
		return nil, fmt.Errorf("unable to decode config: %w", err)
	}
	v1alpha4.SetDefaultsCluster(cfg)
	return cfg, nil
}

func main() {
	var raw []byte
	var err error
	if len(os.Args) > 1 {
		raw, err = os.ReadFile(os.Args[1])
	} else {
		raw, err = io.ReadAll(os.Stdin)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	cfg, err := decode(raw)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	out, _ := json.Marshal(cfg)
	fmt.Println(string(out))
}
