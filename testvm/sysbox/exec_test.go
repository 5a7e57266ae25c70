package sysbox

import "os/exec"

var execLookPath = exec.LookPath
