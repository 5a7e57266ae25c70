package ec2

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
)

// Tags the node writes on its own instance to report progress.
const (
	TagStep   = "pve-bootstrap:step"
	TagStatus = "pve-bootstrap:status"
	// Status values written to TagStatus.
	StatusRunning   = "running"
	StatusRebooting = "rebooting"
	StatusFailed    = "failed"
	StatusDone      = "done"
)

// API is the part of the EC2 client Launch uses.
type API interface {
	RunInstances(ctx context.Context, in *ec2.RunInstancesInput, opts ...func(*ec2.Options)) (*ec2.RunInstancesOutput, error)
	DescribeInstances(ctx context.Context, in *ec2.DescribeInstancesInput, opts ...func(*ec2.Options)) (*ec2.DescribeInstancesOutput, error)
}

// Spec describes the instance to launch.
type Spec struct {
	ImageID          string
	InstanceType     string
	SubnetID         string
	SecurityGroupIDs []string
	KeyName          string
	// InstanceProfile names an IAM instance profile; the node needs
	// ec2:CreateTags on itself to report progress.
	InstanceProfile string
	// RootDevice is the AMI's root device name (Debian: /dev/xvda).
	RootDevice    string
	RootVolumeGiB int32
	Name          string
	Tags          map[string]string
	// UserData is the encoded (gzip+base64) user-data.
	UserData string
}

var (
	nestedFamily = regexp.MustCompile(`^(c8i|m8i|r8i)(-flex)?\.[a-z0-9]+$`)
	metalType    = regexp.MustCompile(`^[a-z][a-z0-9-]*\.metal(-[a-z0-9]+)?$`)
)

// NestedCapable reports whether the type supports nested virtualization
// through CpuOptions (the metal types need none).
func NestedCapable(t string) bool { return nestedFamily.MatchString(t) }

// RunInstancesInput builds the request for spec, or says what is wrong.
func RunInstancesInput(s Spec) (*ec2.RunInstancesInput, error) {
	nested := NestedCapable(s.InstanceType)
	if !nested && !metalType.MatchString(s.InstanceType) {
		return nil, fmt.Errorf("instance type %q: want c8i, m8i or r8i (nested virtualization) or a .metal type", s.InstanceType)
	}
	if !strings.HasPrefix(s.ImageID, "ami-") {
		return nil, fmt.Errorf("image %q: want an ami- id", s.ImageID)
	}
	if s.RootVolumeGiB < 16 {
		return nil, fmt.Errorf("root volume %d GiB: want at least 16", s.RootVolumeGiB)
	}
	if s.UserData == "" || len(s.UserData) > MaxUserData {
		return nil, fmt.Errorf("user-data: %d bytes, want 1..%d", len(s.UserData), MaxUserData)
	}
	if s.RootDevice == "" {
		s.RootDevice = "/dev/xvda"
	}
	tags := []types.Tag{{Key: aws.String("Name"), Value: aws.String(s.Name)}}
	for _, k := range slices.Sorted(maps.Keys(s.Tags)) {
		if k == "Name" || strings.HasPrefix(k, "aws:") || strings.HasPrefix(k, "pve-bootstrap:") {
			return nil, fmt.Errorf("tag %q: reserved", k)
		}
		tags = append(tags, types.Tag{Key: aws.String(k), Value: aws.String(s.Tags[k])})
	}
	tags = append(tags, types.Tag{Key: aws.String(TagStatus), Value: aws.String("launching")})
	in := &ec2.RunInstancesInput{
		ImageId:      aws.String(s.ImageID),
		InstanceType: types.InstanceType(s.InstanceType),
		MinCount:     aws.Int32(1),
		MaxCount:     aws.Int32(1),
		UserData:     aws.String(s.UserData),
		MetadataOptions: &types.InstanceMetadataOptionsRequest{
			HttpEndpoint:            types.InstanceMetadataEndpointStateEnabled,
			HttpTokens:              types.HttpTokensStateRequired,
			HttpPutResponseHopLimit: aws.Int32(1),
			HttpProtocolIpv6:        types.InstanceMetadataProtocolStateDisabled,
			// The node writes its progress as tags; reading them back
			// from IMDS needs no extra permission.
			InstanceMetadataTags: types.InstanceMetadataTagsStateEnabled,
		},
		BlockDeviceMappings: []types.BlockDeviceMapping{{
			DeviceName: aws.String(s.RootDevice),
			Ebs: &types.EbsBlockDevice{
				VolumeSize:          aws.Int32(s.RootVolumeGiB),
				VolumeType:          types.VolumeTypeGp3,
				DeleteOnTermination: aws.Bool(true),
				Encrypted:           aws.Bool(true),
			},
		}},
		TagSpecifications: []types.TagSpecification{
			{ResourceType: types.ResourceTypeInstance, Tags: tags},
			{ResourceType: types.ResourceTypeVolume, Tags: tags[:len(tags)-1]},
		},
	}
	if nested {
		in.CpuOptions = &types.CpuOptionsRequest{NestedVirtualization: types.NestedVirtualizationSpecificationEnabled}
	}
	if s.SubnetID != "" {
		in.SubnetId = aws.String(s.SubnetID)
	}
	if len(s.SecurityGroupIDs) > 0 {
		in.SecurityGroupIds = s.SecurityGroupIDs
	}
	if s.KeyName != "" {
		in.KeyName = aws.String(s.KeyName)
	}
	if s.InstanceProfile != "" {
		in.IamInstanceProfile = &types.IamInstanceProfileSpecification{Name: aws.String(s.InstanceProfile)}
	}
	return in, nil
}

// Instance is what Launch learns about the instance.
type Instance struct {
	ID        string
	PublicIP  string
	PrivateIP string
	State     string
	Tags      map[string]string
}

// Address is the address to reach the node at: public if any, else private.
func (i Instance) Address() string {
	if i.PublicIP != "" {
		return i.PublicIP
	}
	return i.PrivateIP
}

// Launch runs the instance and returns its id.
func Launch(ctx context.Context, api API, s Spec) (string, error) {
	in, err := RunInstancesInput(s)
	if err != nil {
		return "", err
	}
	out, err := api.RunInstances(ctx, in)
	if err != nil {
		return "", fmt.Errorf("run instances: %w", err)
	}
	if len(out.Instances) != 1 || out.Instances[0].InstanceId == nil {
		return "", errors.New("run instances: no instance in the reply")
	}
	return *out.Instances[0].InstanceId, nil
}

// Describe reads one instance.
func Describe(ctx context.Context, api API, id string) (Instance, error) {
	out, err := api.DescribeInstances(ctx, &ec2.DescribeInstancesInput{InstanceIds: []string{id}})
	if err != nil {
		return Instance{}, fmt.Errorf("describe %s: %w", id, err)
	}
	for _, r := range out.Reservations {
		for _, in := range r.Instances {
			if aws.ToString(in.InstanceId) != id {
				continue
			}
			inst := Instance{ID: id, PublicIP: aws.ToString(in.PublicIpAddress), PrivateIP: aws.ToString(in.PrivateIpAddress), Tags: map[string]string{}}
			if in.State != nil {
				inst.State = string(in.State.Name)
			}
			for _, t := range in.Tags {
				inst.Tags[aws.ToString(t.Key)] = aws.ToString(t.Value)
			}
			return inst, nil
		}
	}
	return Instance{}, fmt.Errorf("describe %s: not found", id)
}

// FailedError is a node that reported a failed step.
type FailedError struct {
	ID   string
	Step string
}

func (e *FailedError) Error() string {
	return fmt.Sprintf("instance %s: step %q failed; see `pve-bootstrap node status` on the node", e.ID, e.Step)
}

// Wait polls the instance until the node reports done (or failed), calling
// progress on every change of state, step or status. The instance must reach
// running first; a terminated instance or the timeout ends the wait.
func Wait(ctx context.Context, api API, id string, poll, timeout time.Duration, progress func(Instance)) (Instance, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last string
	for {
		inst, err := Describe(ctx, api, id)
		if err != nil && ctx.Err() != nil {
			return inst, fmt.Errorf("instance %s: not done after %s (last: %s)", id, timeout, last)
		}
		if err == nil {
			now := inst.State + "|" + inst.Tags[TagStep] + "|" + inst.Tags[TagStatus]
			if now != last && progress != nil {
				progress(inst)
			}
			last = now
			switch {
			case inst.State == "terminated" || inst.State == "shutting-down":
				return inst, fmt.Errorf("instance %s is %s", id, inst.State)
			case inst.Tags[TagStatus] == StatusFailed:
				return inst, &FailedError{ID: id, Step: inst.Tags[TagStep]}
			case inst.State == "running" && inst.Tags[TagStatus] == StatusDone:
				return inst, nil
			}
		}
		t := time.NewTimer(poll)
		select {
		case <-ctx.Done():
			t.Stop()
			return inst, fmt.Errorf("instance %s: not done after %s (last: %s)", id, timeout, last)
		case <-t.C:
		}
	}
}
