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
// What the daemon's pool-scoped token may set it sets on each clone
// (CloneChanges; privileges VM.Config.HWType, .Memory, .CPU, .Options,
// .CDROM, .Disk). What needs root@pam (args, hookscript, parallel and real
// serial devices, PCI/USB host devices, virtiofs, ivshmem) is removed from
// the template once by `pve-inspectd template harden VMID` run as root
// (TemplateChanges). Check reports every item with who fixes it.
package hardening
