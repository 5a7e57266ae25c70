// Package hardening is the hardened VM profile every sandbox VM gets or is
// checked for: the emulated-device surface where VM escapes have lived is
// stripped, and nested virtualization is off.
//
// The profile, item by item (Proxmox config keys; qemu-server is the
// source of every fact, see testvm/pveemu/FIDELITY.md "issue 17"):
//
//	display      vga: serial0 and serial0: socket (serial console only)
//	serials      no other serialN, no parallelN
//	usb          no usbN; tablet: 0 (the USB tablet)
//	balloon      balloon: 0 (no virtio-balloon device)
//	cdrom        no drive with media=cdrom (no ISO attached)
//	audio        no audio0
//	tpm          no tpmstate0
//	watchdog     no watchdog device
//	passthrough  no hostpciN, no virtiofsN (host-shared folders), no ivshmem
//	cpu          cpu flags with -nested-virt (qemu-server's VM-specific
//	             shorthand for -vmx on Intel and -svm on AMD,
//	             PVE/QemuServer/CPUFlags.pm); raw -vmx/-svm are refused in
//	             a VM config (only custom CPU models may carry them)
//	machine      q35, version 10.1 or newer (or unpinned)
//	hpet         ostype l26: qemu-server turns HPET off for Linux guests on
//	             machine version 10.1 or newer (Cfg2Cmd/Timer.pm), so no
//	             root-only args are needed
//	firmware     bios seabios: with a serial display qemu-server adds
//	             smm=off (QemuServer.pm should_disable_smm). UEFI without
//	             SMM emulation is not offered on q35: there qemu-server
//	             picks the SMM build of OVMF (OVMF.pm), so the profile
//	             takes SeaBIOS; a UEFI-installed template must be rebuilt
//	args         no args, no hookscript (root-only, arbitrary host effects);
//	             the one exception is args that add only a panic device
//	             (`-device pvpanic` or `-device pvpanic-pci`, which root
//	             may add to the template): a guest panic then shows on
//	             the host as QMP status guest-panicked (PanicDeviceArgs)
//	agent        agent: enabled=1, the single exception: the guest agent's
//	             virtio-serial port is the sandbox's I/O channel
//
// Per-VM options (options.go, Want): a create may ask for more than the
// defaults above, each judged by what it adds to the host-side code a
// hostile guest can drive:
//
//	firmware uefi  bios ovmf and an efidisk0 of efitype 4m (no
//	             pre-enrolled keys: secure boot off, as the reference
//	             plugin). qemu-server passes q35 as the SMM flag when it
//	             picks the OVMF image (OVMF.pm get_ovmf_files: 4m on q35 is
//	             OVMF_CODE_4M.secboot.fd, the SMM build) and disables SMM
//	             only for SeaBIOS with a serial display (should_disable_smm):
//	             so UEFI means KVM's SMM emulation (SMI handling, SMRAM,
//	             RSM) reachable from the guest, and the EFI vars as a pflash
//	             device (QEMU's CFI flash emulation) the guest writes. Both
//	             are small and in every OVMF VM, but neither is needed by
//	             a SeaBIOS guest: a node takes UEFI only with
//	             [api] allow_uefi (default off). Without the SMM build a
//	             guest could tamper with its own vars only, not the host's.
//	cpu          a model from CPUModels, always with -nested-virt. host
//	             is taken: it exposes the host's CPUID features and model
//	             (instructions run on the silicon either way; the guest
//	             learns the exact microarchitecture, which a named model
//	             hides only in name), and nested virtualization stays off.
//	os_type      l26, win10, win11. All keep HPET off (Timer.pm: Linux
//	             on 10.1+, Windows version 6 and up). Windows adds the
//	             Hyper-V enlightenments (CPUConfig.pm
//	             get_hyperv_enlightenments: hv_spinlocks, hv_vapic, hv_time,
//	             hv_reset, hv_vpindex, hv_runtime, hv_relaxed, hv_synic,
//	             hv_stimer, hv_ipi), which is KVM's Hyper-V emulation
//	             (MSRs, hypercalls, SynIC timers) reachable from the guest;
//	             and for win11 on an Intel host with machine 11.0+pve2,
//	             hv_evmcs, a nested-virtualization enlightenment, while the
//	             profile turns vmx off: the guest cannot enter VMX
//	             operation, so KVM's nested (eVMCS) code stays out of its
//	             reach; whether QEMU starts a VM with hv-evmcs and -vmx is
//	             not verified here (no Windows guest, no Intel node). A
//	             node takes Windows only with [api] allow_windows (default
//	             off).
//	controllers  disk: scsi only, checked on the template (a clone keeps
//	             its disks), virtio-scsi; nic: virtio only. ide (emulated
//	             ATA) and e1000 (an emulated Intel NIC) are refused: device
//	             models the guest drives register by register.
//
// The items that follow the options are the OS type, the firmware and,
// when a model is asked for, the CPU model (CheckFor, CloneChangesFor);
// Check is CheckFor with the defaults.
//
// What the daemon's pool-scoped token may set it sets on each clone
// (CloneChanges; privileges VM.Config.HWType, .Memory, .CPU, .Options,
// .CDROM, .Disk). What needs root@pam (args, hookscript, parallel and real
// serial devices, PCI/USB host devices, virtiofs, ivshmem) is removed from
// the template once by `pve-inspectd template harden VMID` run as root
// (TemplateChanges). Check reports every item with who fixes it.
package hardening
