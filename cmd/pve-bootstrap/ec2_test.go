package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awsec2 "github.com/aws/aws-sdk-go-v2/service/ec2"

	cloudec2 "github.com/pve-inspect/pve-inspect/cloud/ec2"
	"github.com/pve-inspect/pve-inspect/provision"
)

// TestEC2LaunchCommand runs `ec2 launch` against a local EC2 endpoint that
// plays a node reporting its way to done through tags.
func TestEC2LaunchCommand(t *testing.T) {
	var mu sync.Mutex
	var forms []url.Values
	describes := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.ParseForm()
		mu.Lock()
		defer mu.Unlock()
		forms = append(forms, r.PostForm)
		const ns = `xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"`
		switch r.PostForm.Get("Action") {
		case "RunInstances":
			fmt.Fprintf(w, `<RunInstancesResponse %s><requestId>1</requestId><instancesSet><item><instanceId>i-0feed</instanceId></item></instancesSet></RunInstancesResponse>`, ns)
		case "DescribeInstances":
			describes++
			status := cloudec2.StatusRunning
			if describes > 2 {
				status = cloudec2.StatusDone
			}
			fmt.Fprintf(w, `<DescribeInstancesResponse %s><requestId>2</requestId><reservationSet><item><instancesSet><item><instanceId>i-0feed</instanceId><instanceState><code>16</code><name>running</name></instanceState><ipAddress>203.0.113.9</ipAddress><tagSet><item><key>%s</key><value>secrets</value></item><item><key>%s</key><value>%s</value></item></tagSet></item></instancesSet></item></reservationSet></DescribeInstancesResponse>`,
				ns, cloudec2.TagStep, cloudec2.TagStatus, status)
		default:
			http.Error(w, "unexpected", http.StatusBadRequest)
		}
	}))
	defer srv.Close()
	d := fixtureDeps(freshMachine())
	d.ec2 = func(_ context.Context, region string) (ec2Client, error) {
		if region != "eu-central-1" {
			t.Errorf("region %q", region)
		}
		return awsec2.New(awsec2.Options{Region: region, BaseEndpoint: aws.String(srv.URL),
			Credentials: credentials.NewStaticCredentialsProvider("AKID", "s", ""), HTTPClient: srv.Client()}), nil
	}
	root := fixtureRoot(t)
	out, err := runCmd(t, d, "ec2", "launch", "--region", "eu-central-1", "--image", "ami-0abc", "--type", "r8i.4xlarge",
		"--instance-profile", "pve-node", "--key-name", "ops", "--node-config", filepath.Join(root, "etc/pve-bootstrap/config.toml"),
		"--binary-url", "https://files.example.test/pve-bootstrap", "--binary-sha256", strings.Repeat("cd", 32), "--poll", "1ms")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, want := range []string{"launched i-0feed", "https://203.0.113.9:8006/", "/etc/pve-inspectd/pve-token", "ssh admin@203.0.113.9", `status="done"`} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "ssm") {
		t.Errorf("output offers SSM, which the node does not run:\n%s", out)
	}
	run := forms[0]
	if run.Get("CpuOptions.NestedVirtualization") != "enabled" || run.Get("MetadataOptions.HttpTokens") != "required" || run.Get("TagSpecification.1.Tag.1.Value") != "pve1" {
		t.Errorf("RunInstances form: %v", run)
	}
	doc, err := cloudec2.Decode(run.Get("UserData"))
	if err != nil || !strings.Contains(string(doc), `report = "ec2-tags"`) || !strings.Contains(string(doc), `sdn_resolver = "169.254.169.253"`) {
		t.Errorf("user-data does not turn on tag reporting: %v\n%s", err, doc)
	}
}

// TestAccessPaths: `ec2 launch` names only the ways in the node has.
func TestAccessPaths(t *testing.T) {
	base := provision.DefaultConfig()
	hashed := base
	hashed.Secrets.RootPasswordHash = "$6$x"
	noFile := base
	noFile.Secrets.RootPasswordFile = ""
	pub := cloudec2.Instance{PublicIP: "203.0.113.9", PrivateIP: "172.31.5.17"}
	priv := cloudec2.Instance{PrivateIP: "172.31.5.17"}
	for _, tc := range []struct {
		name     string
		inst     cloudec2.Instance
		key      string
		cfg      provision.Config
		want     []string
		wantNone []string
	}{
		{name: "key pair, kept password", inst: pub, key: "ops", cfg: base,
			want: []string{"ssh admin@203.0.113.9 (key pair ops)", "ssh -L 8006:localhost:8006 admin@203.0.113.9", "sudo cat /root/root-password",
				"password in /root/root-password", `node "proxmox"`}, wantNone: []string{"ssm", "private only"}},
		{name: "no key pair", inst: pub, cfg: base,
			want: []string{"ssh        none: launched without --key-name", "password in /root/root-password"}, wantNone: []string{"ssh admin@", "ssm", "sudo cat"}},
		{name: "private address only", inst: priv, key: "ops", cfg: base, want: []string{"172.31.5.17 (private only", "ssh admin@172.31.5.17"}},
		{name: "hash from config", inst: pub, key: "ops", cfg: hashed, want: []string{"password of secrets.root_password_hash"}, wantNone: []string{"sudo cat", "/root/root-password"}},
		{name: "no password file", inst: pub, key: "ops", cfg: noFile, want: []string{"went only to secrets.sink"}, wantNone: []string{"sudo cat"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := accessPaths("i-0feed", tc.inst, cloudec2.Spec{KeyName: tc.key}, tc.cfg)
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("lacks %q:\n%s", w, out)
				}
			}
			for _, w := range tc.wantNone {
				if strings.Contains(out, w) {
					t.Errorf("has %q:\n%s", w, out)
				}
			}
		})
	}
}

// TestEC2ImageCommand runs `ec2 image` against a local EC2 endpoint: one
// CreateImage of the node, DescribeImages until available, the id printed.
func TestEC2ImageCommand(t *testing.T) {
	var mu sync.Mutex
	var actions []string
	var create url.Values
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.ParseForm()
		mu.Lock()
		defer mu.Unlock()
		const ns = `xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"`
		a := r.PostForm.Get("Action")
		actions = append(actions, a)
		switch a {
		case "CreateImage":
			create = r.PostForm
			fmt.Fprintf(w, `<CreateImageResponse %s><requestId>1</requestId><imageId>ami-0b01d</imageId></CreateImageResponse>`, ns)
		case "DescribeImages":
			state := "pending"
			if len(actions) > 3 {
				state = "available"
			}
			fmt.Fprintf(w, `<DescribeImagesResponse %s><requestId>2</requestId><imagesSet><item><imageId>ami-0b01d</imageId><imageState>%s</imageState></item></imagesSet></DescribeImagesResponse>`, ns, state)
		default:
			http.Error(w, "unexpected", http.StatusBadRequest)
		}
	}))
	defer srv.Close()
	d := fixtureDeps(freshMachine())
	d.ec2 = func(_ context.Context, region string) (ec2Client, error) {
		return awsec2.New(awsec2.Options{Region: region, BaseEndpoint: aws.String(srv.URL),
			Credentials: credentials.NewStaticCredentialsProvider("AKID", "s", ""), HTTPClient: srv.Client()}), nil
	}
	out, err := runCmd(t, d, "ec2", "image", "--region", "eu-central-1", "--instance", "i-0feed0000000000a1", "--name", "pve-node-1", "--poll", "1ms")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if !strings.Contains(out, "image ami-0b01d available") {
		t.Errorf("output:\n%s", out)
	}
	if create.Get("InstanceId") != "i-0feed0000000000a1" || create.Get("Name") != "pve-node-1" || create.Get("NoReboot") != "false" {
		t.Errorf("CreateImage form: %v", create)
	}
	if n := strings.Count(strings.Join(actions, " "), "CreateImage"); n != 1 {
		t.Errorf("%d CreateImage calls: %q", n, actions)
	}

	// Bad input: a clear error and no call to EC2.
	actions = nil
	if _, err := runCmd(t, d, "ec2", "image", "--instance", "pve1", "--name", "x-node"); err == nil || len(actions) != 0 {
		t.Errorf("bad instance id: err %v, calls %q", err, actions)
	}
}
