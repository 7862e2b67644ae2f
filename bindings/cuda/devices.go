//go:build cuda && cgo && !nocgo

package cuda

import (
	"errors"
	"fmt"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Devices lists the GPUs this process can compute on, in CUDA's order. NVML (the driver's
// management library, opened at run time) names them and reports their memory; the CUDA runtime
// confirms that it can use them. When there is none, the error wraps ErrNoDevice and says why:
// the driver library is missing, the driver is not loaded, there is no GPU, or the driver is too
// old for this build's CUDA runtime.
func Devices() ([]Device, error) {
	byBus, err := nvmlDevices()
	if err != nil {
		return nil, err
	}
	props, err := runtimeDevices()
	if err != nil {
		return nil, err
	}
	devs := make([]Device, len(props))
	for i := range props {
		p := &props[i]
		d := Device{
			Index:           i,
			Name:            cString(p.name[:]),
			PCIBusID:        cString(p.pci_bus_id[:]),
			Major:           int(p.cc_major),
			Minor:           int(p.cc_minor),
			Multiprocessors: int(p.sm_count),
			MemoryTotal:     uint64(p.total_mem),
		}
		if nd, ok := byBus[busKey(d.PCIBusID)]; ok {
			d.UUID, d.MemoryFree = nd.UUID, nd.MemoryFree
			if nd.Name != "" {
				d.Name = nd.Name
			}
		}
		devs[i] = d
	}
	return devs, nil
}

func cString[T ~int8 | ~uint8](b []T) string {
	var sb strings.Builder
	for _, c := range b {
		if c == 0 {
			break
		}
		sb.WriteByte(byte(c))
	}
	return sb.String()
}

// busKey normalises a PCI bus id: NVML writes the domain with eight digits
// ("00000000:65:00.0"), CUDA with four.
func busKey(id string) string {
	id = strings.ToLower(strings.TrimSpace(id))
	if i := strings.IndexByte(id, ':'); i > 4 {
		id = id[i-4:]
	}
	return id
}

// nvmlDevices returns NVML's GPUs by PCI bus id.
func nvmlDevices() (map[string]Device, error) {
	if ret := nvml.Init(); ret != nvml.SUCCESS {
		return nil, fmt.Errorf("cuda: %w: %s", ErrNoDevice, nvmlInitMessage(ret))
	}
	defer nvml.Shutdown()
	n, ret := nvml.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("cuda: %w: NVML cannot count GPUs: %v", ErrNoDevice, ret)
	}
	if n == 0 {
		return nil, fmt.Errorf("cuda: %w: the NVIDIA driver is loaded but reports no GPU", ErrNoDevice)
	}
	out := make(map[string]Device, n)
	var errs []error
	for i := 0; i < n; i++ {
		h, ret := nvml.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			errs = append(errs, fmt.Errorf("GPU %d: %v", i, ret))
			continue
		}
		pci, ret := h.GetPciInfo()
		if ret != nvml.SUCCESS {
			errs = append(errs, fmt.Errorf("GPU %d: PCI info: %v", i, ret))
			continue
		}
		d := Device{Index: -1, PCIBusID: cString(pci.BusId[:])}
		if name, ret := h.GetName(); ret == nvml.SUCCESS {
			d.Name = name
		}
		if uuid, ret := h.GetUUID(); ret == nvml.SUCCESS {
			d.UUID = uuid
		}
		if mem, ret := h.GetMemoryInfo(); ret == nvml.SUCCESS {
			d.MemoryTotal, d.MemoryFree = mem.Total, mem.Free
		}
		if major, minor, ret := h.GetCudaComputeCapability(); ret == nvml.SUCCESS {
			d.Major, d.Minor = major, minor
		}
		out[busKey(d.PCIBusID)] = d
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("cuda: %w: no GPU could be queried: %v", ErrNoDevice, errors.Join(errs...))
	}
	return out, nil
}

func nvmlInitMessage(ret nvml.Return) string {
	switch ret {
	case nvml.ERROR_LIBRARY_NOT_FOUND:
		return "no NVIDIA driver (libnvidia-ml.so.1 not found)"
	case nvml.ERROR_DRIVER_NOT_LOADED:
		return "the NVIDIA driver is not loaded (no GPU, or the kernel module is missing)"
	case nvml.ERROR_NO_PERMISSION:
		return "no permission to open the NVIDIA driver"
	case nvml.ERROR_LIB_RM_VERSION_MISMATCH:
		return "the NVIDIA driver library and kernel module versions differ (reboot or reinstall the driver)"
	}
	return fmt.Sprintf("NVML initialisation failed: %v", ret)
}
