package ec2

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
)

// fakeEC2 speaks the EC2 query protocol: form-encoded POSTs, XML replies.
type fakeEC2 struct {
	mu       sync.Mutex
	requests []url.Values
	// describe answers DescribeInstances calls in turn (the last repeats).
	describe []string
}

func (f *fakeEC2) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || !strings.HasPrefix(r.Header.Get("Content-Type"), "application/x-www-form-urlencoded") {
		http.Error(w, "want a form POST", http.StatusBadRequest)
		return
	}
	if !strings.HasPrefix(r.Header.Get("Authorization"), "AWS4-HMAC-SHA256 ") {
		http.Error(w, "unsigned", http.StatusForbidden)
		return
	}
	if err := r.ParseForm(); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	f.requests = append(f.requests, r.PostForm)
	n := 0
	for _, q := range f.requests {
		if q.Get("Action") == "DescribeInstances" {
			n++
		}
	}
	f.mu.Unlock()
	w.Header().Set("Content-Type", "text/xml")
	const ns = `xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"`
	switch r.PostForm.Get("Action") {
	case "RunInstances":
		fmt.Fprintf(w, `<RunInstancesResponse %s><requestId>req-1</requestId><reservationId>r-1</reservationId><ownerId>123456789012</ownerId><instancesSet><item><instanceId>i-0abc</instanceId><instanceState><code>0</code><name>pending</name></instanceState></item></instancesSet></RunInstancesResponse>`, ns)
	case "DescribeInstances":
		body := f.describe[min(n, len(f.describe))-1]
		fmt.Fprintf(w, `<DescribeInstancesResponse %s><requestId>req-2</requestId><reservationSet><item><reservationId>r-1</reservationId><instancesSet><item><instanceId>i-0abc</instanceId>%s</item></instancesSet></item></reservationSet></DescribeInstancesResponse>`, ns, body)
	case "CreateTags":
		fmt.Fprintf(w, `<CreateTagsResponse %s><requestId>req-3</requestId><return>true</return></CreateTagsResponse>`, ns)
	default:
		http.Error(w, "unknown action", http.StatusBadRequest)
	}
}

func describeBody(state, step, status string) string {
	return fmt.Sprintf(`<instanceState><code>16</code><name>%s</name></instanceState><ipAddress>203.0.113.7</ipAddress><privateIpAddress>10.0.0.5</privateIpAddress><tagSet><item><key>%s</key><value>%s</value></item><item><key>%s</key><value>%s</value></item></tagSet>`,
		state, TagStep, step, TagStatus, status)
}

func newClient(t *testing.T, f *fakeEC2) *ec2.Client {
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return ec2.New(ec2.Options{
		Region:           "eu-west-1",
		BaseEndpoint:     aws.String(srv.URL),
		Credentials:      credentials.NewStaticCredentialsProvider("AKIDTEST", "secret", ""),
		HTTPClient:       srv.Client(),
		RetryMaxAttempts: 1,
	})
}

func TestLaunchRunInstancesRequest(t *testing.T) {
	doc, err := Render(testUD)
	if err != nil {
		t.Fatal(err)
	}
	enc, err := Encode(doc)
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeEC2{}
	cli := newClient(t, f)
	id, err := Launch(context.Background(), cli, Spec{
		ImageID: "ami-0123456789abcdef0", InstanceType: "m8i.2xlarge", SubnetID: "subnet-1",
		SecurityGroupIDs: []string{"sg-1"}, KeyName: "ops", InstanceProfile: "pve-node",
		RootVolumeGiB: 100, Name: "pve1", Tags: map[string]string{"team": "evals"}, UserData: enc,
	})
	if err != nil || id != "i-0abc" {
		t.Fatalf("launch = %q, %v", id, err)
	}
	if len(f.requests) != 1 {
		t.Fatalf("%d requests", len(f.requests))
	}
	q := f.requests[0]
	for k, want := range map[string]string{
		"Action":                          "RunInstances",
		"InstanceType":                    "m8i.2xlarge",
		"ImageId":                         "ami-0123456789abcdef0",
		"CpuOptions.NestedVirtualization": "enabled",
		"MetadataOptions.HttpTokens":      "required",
		"MetadataOptions.HttpPutResponseHopLimit": "1",
		"MetadataOptions.HttpProtocolIpv6":        "disabled",
		"MetadataOptions.HttpEndpoint":            "enabled",
		"BlockDeviceMapping.1.DeviceName":         "/dev/xvda",
		"BlockDeviceMapping.1.Ebs.VolumeSize":     "100",
		"IamInstanceProfile.Name":                 "pve-node",
		"TagSpecification.1.ResourceType":         "instance",
		"TagSpecification.1.Tag.1.Key":            "Name",
		"TagSpecification.1.Tag.1.Value":          "pve1",
		"TagSpecification.1.Tag.2.Key":            "team",
		"TagSpecification.1.Tag.2.Value":          "evals",
		"MinCount":                                "1",
		"MaxCount":                                "1",
	} {
		if got := q.Get(k); got != want {
			t.Errorf("%s = %q, want %q", k, got, want)
		}
	}
	ud, err := Decode(q.Get("UserData"))
	if err != nil || string(ud) != string(doc) {
		t.Errorf("user-data decoded differs from rendered: %v", err)
	}

	// A metal type gets no CpuOptions.
	f2 := &fakeEC2{}
	if _, err := Launch(context.Background(), newClient(t, f2), Spec{
		ImageID: "ami-1", InstanceType: "c7i.metal-24xl", RootVolumeGiB: 50, Name: "m", UserData: enc,
	}); err != nil {
		t.Fatal(err)
	}
	for k := range f2.requests[0] {
		if strings.HasPrefix(k, "CpuOptions") {
			t.Errorf("metal request carries %s", k)
		}
	}
}

func TestRunInstancesInputRejects(t *testing.T) {
	good := Spec{ImageID: "ami-1", InstanceType: "c8i.large", RootVolumeGiB: 32, UserData: "x"}
	for name, mod := range map[string]func(*Spec){
		"no nested support": func(s *Spec) { s.InstanceType = "m7i.large" },
		"not an ami":        func(s *Spec) { s.ImageID = "img-1" },
		"small disk":        func(s *Spec) { s.RootVolumeGiB = 8 },
		"no user-data":      func(s *Spec) { s.UserData = "" },
		"reserved tag":      func(s *Spec) { s.Tags = map[string]string{"pve-bootstrap:status": "done"} },
	} {
		s := good
		mod(&s)
		if _, err := RunInstancesInput(s); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := RunInstancesInput(good); err != nil {
		t.Errorf("good spec: %v", err)
	}
	for _, typ := range []string{"c8i.large", "m8i-flex.xlarge", "r8i.48xlarge"} {
		if !NestedCapable(typ) {
			t.Errorf("%s not nested-capable", typ)
		}
	}
}

func TestWaitFollowsNodeTags(t *testing.T) {
	f := &fakeEC2{describe: []string{
		`<instanceState><code>0</code><name>pending</name></instanceState>`,
		describeBody("running", "hostname", StatusRunning),
		describeBody("running", "proxmox-kernel", StatusRebooting),
		describeBody("running", "secrets", StatusDone),
	}}
	var seen []string
	inst, err := Wait(context.Background(), newClient(t, f), "i-0abc", time.Millisecond, time.Minute, func(i Instance) {
		seen = append(seen, i.State+"/"+i.Tags[TagStep]+"/"+i.Tags[TagStatus])
	})
	if err != nil {
		t.Fatal(err)
	}
	if inst.Address() != "203.0.113.7" || len(seen) != 4 || seen[3] != "running/secrets/done" {
		t.Errorf("inst %+v, progress %q", inst, seen)
	}

	f = &fakeEC2{describe: []string{describeBody("running", "proxmox-ve", StatusFailed)}}
	_, err = Wait(context.Background(), newClient(t, f), "i-0abc", time.Millisecond, time.Minute, nil)
	var fe *FailedError
	if !errors.As(err, &fe) || fe.Step != "proxmox-ve" {
		t.Errorf("failed node: %v", err)
	}

	f = &fakeEC2{describe: []string{describeBody("running", "full-upgrade", StatusRunning)}}
	_, err = Wait(context.Background(), newClient(t, f), "i-0abc", time.Millisecond, 50*time.Millisecond, nil)
	if err == nil || !strings.Contains(err.Error(), "not done after") {
		t.Errorf("timeout: %v", err)
	}
}

func TestTagReporter(t *testing.T) {
	f := &fakeEC2{}
	r := TagReporter{API: newClient(t, f), InstanceID: "i-0abc"}
	if err := r.Report(context.Background(), "proxmox-ve", StatusRunning); err != nil {
		t.Fatal(err)
	}
	q := f.requests[0]
	if q.Get("Action") != "CreateTags" || q.Get("ResourceId.1") != "i-0abc" || q.Get("Tag.1.Key") != TagStep || q.Get("Tag.1.Value") != "proxmox-ve" || q.Get("Tag.2.Value") != StatusRunning {
		t.Errorf("CreateTags form: %v", q)
	}
}
