// Command gpuallocator-check answers GetPreferredAllocation requests with NVIDIA
// go-gpuallocator v0.6.0's own best-effort policy, over whatever libnvidia-ml.so.1 the
// process loads (the lab's NVML shim, through LD_LIBRARY_PATH and FAKE_GPU_CONFIG).
//
// It does what k8s-device-plugin v0.20.0 internal/rm/nvml_manager.go alignedAlloc does:
// gpuallocator.NewDevices(WithNvmlLib(nvml.New())) once, then per request
// linkedDevices.Filter(available), linkedDevices.Filter(required) and
// NewBestEffortPolicy().Allocate(available, required, size).
//
// Input: one JSON request per line on stdin, {"available": [uuid...], "required":
// [uuid...], "size": n}. Output: one JSON line per request, {"chosen": [uuid...]} where a
// padding slot the policy returned is null (the plugin would dereference it), or
// {"error": "..."}. Before the first request it prints {"devices": [...]}: each GPU's
// index, UUID, the link types go-gpuallocator read for every other GPU and its pair score
// with every GPU.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	_ "unsafe" // go:linkname

	"github.com/NVIDIA/go-gpuallocator/gpuallocator"
	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// calculateGPUPairScore is go-gpuallocator's own (unexported) pair score, the one
// Allocate sums; linked by name so the scores can be compared pair by pair, not only
// through the choices they lead to.
//
//go:linkname calculateGPUPairScore github.com/NVIDIA/go-gpuallocator/gpuallocator.calculateGPUPairScore
func calculateGPUPairScore(gpu0 *gpuallocator.Device, gpu1 *gpuallocator.Device) int

type request struct {
	Available []string `json:"available"`
	Required  []string `json:"required"`
	Size      int      `json:"size"`
}

type response struct {
	Chosen []*string `json:"chosen"`
	Error  string    `json:"error,omitempty"`
}

type deviceInfo struct {
	Index int              `json:"index"`
	UUID  string           `json:"uuid"`
	Links map[int][]string `json:"links"`
	// Scores[j]: calculateGPUPairScore(this GPU, GPU j).
	Scores []int `json:"scores"`
}

func allocate(devices gpuallocator.DeviceList, req request) response {
	available, err := devices.Filter(req.Available)
	if err != nil {
		return response{Error: fmt.Sprintf("unable to retrieve list of available devices: %v", err)}
	}
	required, err := devices.Filter(req.Required)
	if err != nil {
		return response{Error: fmt.Sprintf("unable to retrieve list of required devices: %v", err)}
	}
	chosen := []*string{}
	for _, d := range gpuallocator.NewBestEffortPolicy().Allocate(available, required, req.Size) {
		if d == nil {
			chosen = append(chosen, nil)
			continue
		}
		uuid := d.UUID
		chosen = append(chosen, &uuid)
	}
	return response{Chosen: chosen}
}

func main() {
	devices, err := gpuallocator.NewDevices(gpuallocator.WithNvmlLib(nvml.New()))
	if err != nil {
		fmt.Fprintf(os.Stderr, "gpuallocator-check: unable to get device link information: %v\n", err)
		os.Exit(1)
	}
	out := json.NewEncoder(os.Stdout)
	infos := []deviceInfo{}
	for _, d := range devices {
		links := map[int][]string{}
		for peer, ls := range d.Links {
			for _, l := range ls {
				links[peer] = append(links[peer], l.Type.String())
			}
		}
		scores := []int{}
		for _, other := range devices {
			scores = append(scores, calculateGPUPairScore(d, other))
		}
		infos = append(infos, deviceInfo{Index: d.Index, UUID: d.UUID, Links: links, Scores: scores})
	}
	if err := out.Encode(map[string]any{"devices": infos}); err != nil {
		os.Exit(1)
	}
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<20)
	for in.Scan() {
		var req request
		if err := json.Unmarshal(in.Bytes(), &req); err != nil {
			fmt.Fprintf(os.Stderr, "gpuallocator-check: bad request %q: %v\n", in.Text(), err)
			os.Exit(2)
		}
		if err := out.Encode(allocate(devices, req)); err != nil {
			os.Exit(1)
		}
	}
}
