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
//	scsi         scsiN disks on virtio-scsi (scsihw virtio-scsi-pci or
//	             virtio-scsi-single): qemu-server's default scsihw is lsi,
//	             and lsi, lsi53c810, megasas and pvscsi are emulated HBAs
//	             the guest drives register by register. Fixed on the
//	             template by `template harden` (its guest needs the
//	             virtio-scsi driver to boot on it), never on a clone
//	kvm          kvm absent or 1: kvm 0 runs the guest under TCG, QEMU's
//	             software emulator, which QEMU does not treat as a
//	             security boundary (and where -nested-virt leaves the
//	             qemu64 models' SVM on an Intel node)
//	hyper-v      no +hv-* cpu flags (hv-tlbflush, hv-evmcs: qemu-server's
//	             VM-specific flags, CPUFlags.pm); the clone fix drops them
//	machine      q35, version 10.1 or newer (or unpinned), and no machine
//	             property but the type (viommu, aw-bits, enable-s3,
//	             enable-s4: Machine.pm $machine_fmt); a Windows guest's is
//	             pinned (see os_type below)
//	hpet         ostype l26: qemu-server turns HPET off for Linux guests on
//	             machine version 10.1 or newer (Cfg2Cmd/Timer.pm), so no
//	             root-only args are needed
//	firmware     bios seabios: with a serial display qemu-server adds
//	             smm=off (QemuServer.pm should_disable_smm). UEFI without
//	             SMM emulation is not offered on q35: there qemu-server
//	             picks the SMM build of OVMF (OVMF.pm), so the profile
//	             takes SeaBIOS; a UEFI template (bios ovmf: an OVA's UEFI
//	             guest imported without boot) serves only creates that
//	             ask firmware uefi, and is checked for them (CheckTemplate)
//	args         no args, no hookscript (root-only, arbitrary host effects);
//	             the one exception is args that add only a panic device
//	             (`-device pvpanic` or `-device pvpanic-pci`, which root
//	             may add to the template): a guest panic then shows on
//	             the host as QMP status guest-panicked (PanicDeviceArgs)
//	nic model    every netN virtio (the configure step writes each NIC;
//	             a template's own NICs are replaced on every clone)
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
//	             on 10.1+, Windows version 6 and up). A Windows VM never
//	             runs an unpinned machine: qemu-server pins it when ostype
//	             is set without machine (API2/Qemu.pm update_vm_api,
//	             Machine.pm check_and_pin_machine_string: the newest
//	             installed version, pc-i440fx- when machine is unset) and
//	             at each start of an unpinned one (get_vm_machine: the
//	             creation QEMU's version, 5.1 without one). So the daemon
//	             pins it itself, sending machine with ostype:
//	             MinMachine (pc-q35-10.1, run as pc-q35-10.1+pve0), or the
//	             template's own q35 pin when 10.1 or newer
//	             (WindowsMachine); the machine item wants it pinned.
//	             Windows adds the
//	             Hyper-V enlightenments (CPUConfig.pm
//	             get_hyperv_enlightenments: hv_spinlocks, hv_vapic, hv_time,
//	             hv_reset, hv_vpindex, hv_runtime, hv_relaxed, hv_synic,
//	             hv_stimer, hv_ipi), which is KVM's Hyper-V emulation
//	             (MSRs, hypercalls, SynIC timers) reachable from the guest;
//	             and for win11 on an Intel host with machine 11.0+pve2 (only
//	             from a template pinned to it: the daemon's own pin is
//	             10.1), hv_evmcs, a nested-virtualization enlightenment, while the
//	             profile turns vmx off: the guest cannot enter VMX
//	             operation, so KVM's nested (eVMCS) code stays out of its
//	             reach; whether QEMU starts a VM with hv-evmcs and -vmx is
//	             not verified here (no Windows guest, no Intel node). A
//	             node takes Windows only with [api] allow_windows (default
//	             off).
//	disk         scsi or ide, checked on the template (a clone keeps its
//	             disks): every disk on scsiN (the scsi item above wants
//	             virtio-scsi whatever is asked) or every disk on ideN. ide
//	             adds no controller: on q35 an ideN disk is an ide-hd on
//	             bus ide.N of the ICH9 AHCI controller every q35 VM has
//	             (qemu-server DriveDevice.pm print_drivedevice_full), whose
//	             ports a guest drives with or without disks; the disk adds
//	             QEMU's ATA command emulation for it (hw/ide/core.c).
//	             Nothing to opt in to.
//	nic          virtio (default) or e1000, written on every netN by the
//	             configure step and checked by the nic model item. e1000 is
//	             QEMU's emulated Intel 82540EM (hw/net/e1000.c: MMIO
//	             registers, EEPROM, descriptor-ring DMA the guest programs),
//	             device code virtio-net does not have, with a history of
//	             guest-triggerable bugs (CVE-2016-1981, CVE-2021-20257:
//	             loops on malformed descriptors). A node takes it only with
//	             [api] allow_e1000 (default off). The guard is the same:
//	             the tap is tap<vmid>i<n> whatever the model.
//	agent        off for a VM a create asks agent false of (a guest
//	             without qemu-ga): the agent item then wants the agent
//	             absent or enabled=0, so the clone has no virtio-serial
//	             port and the node no qga socket (qemu-server
//	             config_to_command adds both only with agent enabled). One
//	             device fewer than a VM with the agent.
//
// The items that follow the options are the OS type, the machine (pinned
// for Windows), the firmware, the NIC model, the agent and, when a model
// is asked for, the CPU model (CheckFor, CloneChangesFor); Check is
// CheckFor with the defaults.
//
// What the daemon's pool-scoped token may set it sets on each clone
// (CloneChanges; privileges VM.Config.HWType, .Memory, .CPU, .Options,
// .CDROM, .Disk). What needs root@pam (args, hookscript, parallel and real
// serial devices, PCI/USB host devices, virtiofs, ivshmem) is removed from
// the template once by `pve-inspectd template harden VMID` run as root
// (TemplateChanges), which also moves scsiN disks off an emulated SCSI HBA
// (scsihw SCSIHW): the token could, but a guest without the virtio-scsi
// driver would no longer boot, which an operator checks once on the
// template rather than the daemon finding it on every clone. Check reports
// every item with who fixes it; with [api] require_hardened_templates off
// the template items (FixTemplate) are excused, the firmware (FixRebuild)
// never.
package hardening
